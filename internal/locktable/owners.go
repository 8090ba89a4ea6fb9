package locktable

type ownerList struct {
	head *lock
	n    int
}

func (t *Table) ownerAdd(l *lock) {
	ol := t.owners[l.owner]
	if ol == nil {
		ol = &ownerList{}
		t.owners[l.owner] = ol
	}
	l.oprev = nil
	l.onext = ol.head
	if ol.head != nil {
		ol.head.oprev = l
	}
	ol.head = l
	ol.n++
}

func (t *Table) ownerDel(l *lock) {
	ol := t.owners[l.owner]
	if l.oprev != nil {
		l.oprev.onext = l.onext
	} else {
		ol.head = l.onext
	}
	if l.onext != nil {
		l.onext.oprev = l.oprev
	}
	l.oprev, l.onext = nil, nil
	if ol.n--; ol.n == 0 {
		delete(t.owners, l.owner)
	}
}
