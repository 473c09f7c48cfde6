"""mlip_unc.train"""
