"""amqtransport/_backends."""
