package sandbox

// SetBeforePromote makes Join call f between starting a learner and promoting it (tests only).
func (c *EtcdCluster) SetBeforePromote(f func(name string)) { c.beforePromote = f }
