"""``tokentrail collect``: drive harnesses over a task set, verify the answers, deliver rewarded rollouts."""
