module torpor/wire

go 1.22
