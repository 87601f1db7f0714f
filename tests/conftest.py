pytest_plugins = ["support.kafka_broker"]
