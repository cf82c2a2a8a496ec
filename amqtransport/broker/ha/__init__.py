"""amqtransport/broker/ha."""
