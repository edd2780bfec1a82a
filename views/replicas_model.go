package views

import "time"

// ReplicaRow is one live replica as the replicas page shows it.
type ReplicaRow struct {
	ID, Address         string
	StartedAt, LastSeen time.Time
	Shards              int
	Self                bool
}

// TenureRow is one shard this replica holds.
type TenureRow struct {
	Shard          int
	Epoch          uint64
	Since, Expires time.Time
	Deadline       time.Time
}

// Replicas is the data of the replicas page: the region's shard
// ownership as this replica last read it.
type Replicas struct {
	Page
	Configured bool
	ReadAt     time.Time
	Shards     int
	Replicas   []ReplicaRow
	Unowned    []int
	Owned      []TenureRow
}
