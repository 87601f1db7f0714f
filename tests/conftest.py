pytest_plugins = ["support.kafka_broker", "support.postgres_server", "support.cluster_processes"]
