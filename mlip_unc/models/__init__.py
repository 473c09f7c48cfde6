"""mlip_unc.models"""
