"""Analyses of trained and random-init models; each module writes a run directory."""
