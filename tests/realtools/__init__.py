"""Test support: a serving replica with real queueing (queue_server) and an independent
simulation of the same model (queue_truth), so capplan can be proven against a server it did
not write whose true capacity is known. Not part of the library; must not import capplan.sim
or capplan.twin."""
