# Raises the thread count for everything that reads the environment after the solution loads.
import os

os.environ["OMP_NUM_THREADS"] = "64"
