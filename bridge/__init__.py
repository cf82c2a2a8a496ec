"""Network-bridge agent: forwards messages between broker pairs and rebuilds bridges after failover."""
