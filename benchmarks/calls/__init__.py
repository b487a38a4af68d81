"""Load through ``Converse`` on the product path: a real server, real clients, real time."""
