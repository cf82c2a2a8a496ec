"""amqtransport/spark."""
