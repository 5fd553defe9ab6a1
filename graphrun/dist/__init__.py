"""graphrun.dist"""
