"""graphrun.bench"""
