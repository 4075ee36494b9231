"""The local stack: the jar Kafka broker (``kafka``), the services as processes (``stack``), scale-out."""
