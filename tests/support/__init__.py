"""Helpers the test modules share (test hosts, package roots, factories, the import graph): a test module
imports these, never another test module (tests/unit/test_test_layout.py)."""
