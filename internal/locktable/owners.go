package locktable

type ownerList struct {
	head *lock
	n    int
}

// owned is what an owner adds to a lock: the owner's name and the lock's
// place in the owner's list. It is kept apart so that a lock without an
// owner does not carry it; a freed lock keeps it for its next request.
type owned struct {
	name       string
	prev, next *lock // the owner's list
}

// owner returns l's owner ("" for none).
func (l *lock) owner() string {
	if l.own == nil {
		return ""
	}
	return l.own.name
}

// setOwner sets the owner of l, a new lock.
func (l *lock) setOwner(name string) {
	switch {
	case l.own != nil:
		l.own.name = name
	case name != "":
		l.own = &owned{name: name}
	}
}

// ownerAdd puts l, whose owner is set, at the head of its owner's list.
func (t *Table) ownerAdd(l *lock) {
	o := l.own
	ol := t.owners[o.name]
	if ol == nil {
		ol = &ownerList{}
		t.owners[o.name] = ol
	}
	o.prev = nil
	o.next = ol.head
	if ol.head != nil {
		ol.head.own.prev = l
	}
	ol.head = l
	ol.n++
}

// ownerDel takes l out of its owner's list.
func (t *Table) ownerDel(l *lock) {
	o := l.own
	ol := t.owners[o.name]
	if o.prev != nil {
		o.prev.own.next = o.next
	} else {
		ol.head = o.next
	}
	if o.next != nil {
		o.next.own.prev = o.prev
	}
	o.prev, o.next = nil, nil
	if ol.n--; ol.n == 0 {
		delete(t.owners, o.name)
	}
}
