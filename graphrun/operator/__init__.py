"""graphrun.operator"""
