"""graphrun.placement"""
