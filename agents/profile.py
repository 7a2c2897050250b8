def register_profile(sub):
    pass
