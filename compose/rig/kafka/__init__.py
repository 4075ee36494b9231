"""Apache Kafka from Maven Central jars, one KRaft broker on loopback (``broker``, ``tokentrail kafka``)."""
