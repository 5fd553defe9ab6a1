"""graphrun.train"""
