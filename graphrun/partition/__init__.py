"""graphrun.partition"""
