"""Test support for the suite, the demo and the benchmarks: the API mock, a REST client, a Job player.

Needs the `dev` extra (kmock, aiohttp); nothing in the operator imports it.
"""
