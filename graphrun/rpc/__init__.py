"""graphrun.rpc"""
