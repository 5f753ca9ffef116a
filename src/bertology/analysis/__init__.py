"""What contextual representations reveal: one module per analysis (word senses, geometry, probing, attention
heads), each a Python call and a command that write their numbers as JSON and their figures as PNG, and a
`Section` for the one HTML report (`bertology analyze`)."""

from bertology.analysis.base import Section, write_numbers

__all__ = ["Section", "write_numbers"]
