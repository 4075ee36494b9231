"""``tokentrail soak``: the chaos workload for an hour, faults and announcements among it, sampled every minute."""
