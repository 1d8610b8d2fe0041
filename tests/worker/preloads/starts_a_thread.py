"""Starts a thread when imported: no fork server may preload it."""
import threading
import time

threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
