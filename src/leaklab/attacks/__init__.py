"""Attacks on what a training protocol shares. Each sees only a ServerView and a ClientUpdate."""
