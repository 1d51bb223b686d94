"""tensors"""
