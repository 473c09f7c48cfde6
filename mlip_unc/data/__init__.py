"""mlip_unc.data"""
