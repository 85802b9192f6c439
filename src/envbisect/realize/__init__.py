"""realize."""
