package views

import "time"

// ReplicaRow is one live replica as the replicas page shows it.
type ReplicaRow struct {
	ID, Address         string
	StartedAt, LastSeen time.Time
	Shards              int
	Self                bool
	// Relay is this replica's relay from it (nil: itself, or not
	// followed).
	Relay *RelayRow
}

// RelayRow is the relay from one peer.
type RelayRow struct {
	Connected  bool
	Since      time.Time
	LagSeconds float64
	Updates    uint64
	LastError  string
	// Stale: this replica does not hear the peer while the replicas in
	// HeardBy do, so it does not serve the peer's StaleServices services
	// as current.
	Stale         bool
	HeardBy       []string
	StaleServices int
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
	// Relaying: this replica follows its peers (the region has a
	// signing key). EpochsLeft is the region's version epochs left (-1:
	// unknown).
	Relaying   bool
	EpochsLeft int64
}
