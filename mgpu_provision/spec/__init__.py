"""Rig file: models, loading with line numbers, cross-field rules."""
