"""Short recipes composing the components into whole runs."""
