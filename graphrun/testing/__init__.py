"""graphrun.testing"""
