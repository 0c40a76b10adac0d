"""Back-of-the-envelope analyses that need no model weights and no torch (e.g. the SBD roofline)."""
