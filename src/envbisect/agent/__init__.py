"""Code that runs inside the *target* Python, shipped on stdin (stdlib only, Python 3.8+)."""
