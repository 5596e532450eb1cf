module annals

go 1.23
