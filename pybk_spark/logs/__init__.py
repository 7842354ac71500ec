"""Logs on top of ledgers, client side: the log writer, the log reader and registered read positions."""
