"""mlip_unc.uncertainty"""
