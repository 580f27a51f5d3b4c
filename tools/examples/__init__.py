"""Example programs that use mrc as a service (mrc.client against running daemons)."""
