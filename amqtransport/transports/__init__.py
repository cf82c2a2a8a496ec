"""amqtransport/transports."""
