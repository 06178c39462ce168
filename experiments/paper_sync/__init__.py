"""Elastic synchronization (DSSP, ICDCS 2019; ElasticBSP + ZipLine, ICDM 2019): the policies on a
simulated cluster and on Ray, ZipLine's runtimes. Configs in ``configs/``.
"""
