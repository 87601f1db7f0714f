pytest_plugins = ["kafka_broker"]
