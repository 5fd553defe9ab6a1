"""graphrun.sampling"""
