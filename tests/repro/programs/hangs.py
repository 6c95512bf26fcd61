"""Never finishes (for the timeout test): sleeps without training."""
import time

time.sleep(3600)
