"""graphrun.job"""
