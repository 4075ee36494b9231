"""Tools that exercise the stack: ``bench`` (figures), ``chaos`` (faults under load), the demos."""
