"""jetwake"""
