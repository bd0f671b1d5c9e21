"""training/algorithms"""
