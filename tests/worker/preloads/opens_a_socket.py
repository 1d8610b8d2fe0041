"""Opens a socket when imported: no fork server may preload it."""
import socket

HELD = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
