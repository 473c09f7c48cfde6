"""mlip_unc.nn"""
