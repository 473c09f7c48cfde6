"""mlip_unc.active"""
