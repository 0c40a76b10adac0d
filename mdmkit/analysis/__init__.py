"""What results become for a reader: Pareto fronts and their tables and plots, AUP, the SBD roofline, the
samplers' overhead and KV-cache speed, and the pages (figure + table + command) that show them."""
