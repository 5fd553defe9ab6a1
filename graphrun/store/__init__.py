"""graphrun.store"""
